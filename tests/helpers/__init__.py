"""Plain helper functions the tests share (writers of tiny GGUFs, fakes, reference math), imported as
`helpers.<module>`: pytest puts tests/ on the path (pyproject `pythonpath`). Fixtures live in tests/conftest.py."""
