"""The JAX Mixture-of-Experts expert block on the ragged dot (experts.py) and its dispatch decisions (plan.py)."""
