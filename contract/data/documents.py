"""Where the documents of a sample begin and end (data.document_mask): the prepared format's own record of them.

A prepared dataset (manifest.py) writes the end-of-document id after every document and nowhere else: a special
token's text inside a document is encoded as text (launcher/prepare/tokenizer.py), so in a prepared stream that
id marks exactly the ends of documents. A window's document ids are counted from those marks on the data side,
with the id its manifest records, and handed to the model beside the tokens; the model never guesses boundaries.
"""

from __future__ import annotations

import numpy as np


def document_ids(tokens: np.ndarray, eod_id: int) -> np.ndarray:
    """[n, L] token windows -> [n, L] int32: the ordinal, within its window, of the document each token belongs to.
    An end-of-document id belongs to the document it ends; the token after it starts the next one."""
    ends = np.asarray(tokens) == eod_id
    ids = np.zeros(ends.shape, dtype=np.int32)
    np.cumsum(ends[:, :-1], axis=1, dtype=np.int32, out=ids[:, 1:])
    return ids
