"""Terminal output: one stderr console, progress bars, summaries and reports."""
