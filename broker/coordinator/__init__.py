"""The coordinators and the internal topics they keep their state in: consumer groups now,
transactions next.
"""
