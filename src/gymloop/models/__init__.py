"""Models gymloop builds itself (the embedded `nano` default)."""
