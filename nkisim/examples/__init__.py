"""Small NKI 0.6 kernels written from the public docs' idioms, used by the demo and the tests."""
