"""Worker groups: one worker per rank, on Ray actors or in this process."""
