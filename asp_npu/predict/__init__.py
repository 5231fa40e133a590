"""Response-length predictors (history, prompt features, oracle) and their evaluation."""
