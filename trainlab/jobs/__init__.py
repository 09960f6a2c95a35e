"""The stage bodies: prepare, train, evaluate, profile, the text baseline, the summary (stages/ holds their command lines)."""
