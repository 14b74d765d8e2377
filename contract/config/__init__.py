"""The config contract.

    schema.py    the dataclasses that declare every key once (type, default, range, choices); YAML only sets values
    container.py the container.* keys: the image the ranks run in and how its runtime starts it
    search.py    the search.* keys of a hyperparameter search (hydra/sweeper=search)
    suggest.py   the declared key a misspelt one most likely means (launch checks, open sections on both sides)

Hydra's registration of the schema is the login side's (launcher/config_store.py).
"""
