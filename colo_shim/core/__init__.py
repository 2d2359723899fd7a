"""What every fix uses: declarations and their lazy application (registry), pickle-safe wrappers,
version gates, environment switches, deferred arming, and the table of families.

Nothing here imports a fix; fixes are named in families.py and loaded by name when installed.
"""
