"""Code shared by the NeMo-RL release doubles (tests/doubles/nemo_rl_v0_3, nemo_rl_v0_4, nemo_rl_v0_7).

Not a double of any upstream file. Each release root keeps upstream's module, class and function
names (colo-shim patches them by module + attribute); where a release's code is the same as another
release's, its module re-exports or delegates to a module here. Importable as `nemo_rl_common`
once tests/doubles is on sys.path, next to the release root.
"""
