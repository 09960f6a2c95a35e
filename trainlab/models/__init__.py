"""The architectures: image classifier, U-Net segmenter, text Transformer and n-gram bag, weight init. Import the
module you need (trainlab.models.classifier, ...): a package import loads none of them."""
