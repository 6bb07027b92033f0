"""Cost accounting: the ledger (measured seconds x the hardware's price, tokens, FLOPs: cost per
token, intelligence per dollar, projections) and the priced hardware profiles (`profiles.yaml`)."""
