"""What a person sees: tables, progress lines, and the demos the checkout runs."""
