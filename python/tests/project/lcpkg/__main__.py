raise SystemExit("lcpkg.__main__ must not be imported by --leakcheck-imports")
