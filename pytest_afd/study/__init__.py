"""The RFC's study: freeze (step 1), reference cases (step 4), publication (step 8)."""
