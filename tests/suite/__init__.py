"""Tests of llama.cpp's own server test suite and llama-server's flags."""
