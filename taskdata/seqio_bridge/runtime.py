"""Importing seqio next to Apache Beam: the one place where taskdata sets an environment variable.

seqio imports sentencepiece's generated ``sentencepiece_model_pb2`` when it is imported. taskdata needs
sentencepiece 0.2.3: 0.2.0 and 0.2.1 lack ``Encode(return_type=)``, 0.2.2 trains vocabularies 20 to 70
times slower, and every other version trains other bytes for the built-in vocabulary. sentencepiece
0.2.3 generated that module with protobuf 7 and refuses an older protobuf runtime, while Apache Beam
2.77 requires protobuf < 7. protobuf's runtime check reads ``TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK``;
seqio only builds and reads SentencePiece model protos (plain proto2 messages), which protobuf 6 handles
(the seqio tests run every path through it). So ``import_seqio`` sets the variable, unless the user set
it, right before the import: in the launcher and on every Beam worker, which import seqio through here.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["PROTOBUF_CHECK_ENV", "import_seqio"]

PROTOBUF_CHECK_ENV = "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK"


def import_seqio() -> ModuleType:
    """The ``seqio`` module, importable next to Beam; a clear error if it is not installed."""
    os.environ.setdefault(PROTOBUF_CHECK_ENV, "true")
    try:
        import seqio
    except ModuleNotFoundError as e:
        if e.name != "seqio":
            raise
        raise ModuleNotFoundError(
            "The seqio bridge needs seqio, which is not installed. Install it with "
            "\"pip install 'taskdata[seqio]'\" (seqio 0.0.20)."
        ) from None
    return seqio
