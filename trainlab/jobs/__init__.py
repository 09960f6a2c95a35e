"""The stage bodies: prepare, train (and its command line), evaluate, profile, the summary and the pictures
(stages/ holds the command lines; the text baseline is the text task's, in trainlab.tasks.text_baseline)."""
