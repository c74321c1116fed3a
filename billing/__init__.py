"""Billing: pricing, the credit ledger (reserve → settle), usage records, and the stores behind them."""
