"""The stage bodies, one module each (prepare, text_baseline, train and its command line, evaluate, profile), each
owning its MLflow tracking; and the summary and the pictures. stages/ holds only the command lines."""
