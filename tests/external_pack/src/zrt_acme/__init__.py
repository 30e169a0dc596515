"""zrt-acme: an example third-party hardware pack for zrt (the fictional Acme A1)."""
