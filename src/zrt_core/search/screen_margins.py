"""Screen-vs-exact bounds measured over the benchmark spaces (written by
``benchmarks/bench_search_screen.py --write``: the lowest and highest exact ÷ screened
ratio over them, 1% beyond)."""

MEASURED = {'tput_lo': 0.9745512176845794, 'tput_hi': 1.010899319386766, 'mem_lo': 0.9899999999999988, 'mem_hi': 1.0100084690290851, 'spaces': ['llama3-70b-1024xh100', 'qwen3-30b-a3b-64xh100', 'llama3-8b-16xh100']}
