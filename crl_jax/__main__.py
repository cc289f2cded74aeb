"""`python -m crl_jax ...` = the `crl-jax` command."""

from crl_jax.infra.cli import main

if __name__ == "__main__":
    main()
