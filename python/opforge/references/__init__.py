"""Each op's reference implementations (ops/<name>/reference.py), installed here by the build."""
