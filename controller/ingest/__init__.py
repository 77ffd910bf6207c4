"""What a run reports, stored: the learner's event stream turned into rows and live frames, in bulk."""
