"""Services own transactions and decisions; routes call one of them and render what it returns."""
