"""lcpkg - a package for --leakcheck-imports: clean modules and one that leaks."""
