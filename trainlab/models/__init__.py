"""The architectures. `architectures` is the table of each task's (`<task>.arch` -> the module that builds it; no
torch); `classifier`, `segmenter` and `text` build the model of `<task>.arch` from it. One module per architecture:
resnet_small (the classifier's default) and torchvision_nets (resnet18, mobilenet_v3_small, efficientnet_b0); unet
(the segmenter's); tfidf_bag (the TF-IDF bag, the default text architecture), ngram_bag (the fastText-style and
NB-weighted n-gram bags, ngram_bag and nb_bag) and transformer. Shared: init (weight initialisation, parameter
counts), weights (weights from a file) and checkpointing (activation checkpointing of a block). Import the module
you need (trainlab.models.tfidf_bag, ...): a package import loads none of them."""
