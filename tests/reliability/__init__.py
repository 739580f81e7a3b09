"""Tests of reliability: lifecycle, sleep, shutdown, soak, crashes, replicas."""
