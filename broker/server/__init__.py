"""The broker assembled and run: its parts built from config, started and stopped in order, and
the checks, endpoints, metrics and background jobs around them.
"""
