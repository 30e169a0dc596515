"""A model's architecture and its analytic parameter and FLOP counts, from the config alone:
below the capture and the analytic front-end, which both use them."""
