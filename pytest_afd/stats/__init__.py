"""Repetition statistics, session noise, verdicts and the host conditions they are judged under."""
