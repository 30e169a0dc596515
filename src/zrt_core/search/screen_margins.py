"""Screen-vs-exact bounds measured over the benchmark spaces (written by
``benchmarks/bench_search_screen.py --write``; provisional until that is run)."""

MEASURED = {"tput_lo": 0.9, "tput_hi": 1.1, "mem_lo": 0.9, "mem_hi": 1.1, "spaces": []}
