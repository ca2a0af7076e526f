"""``tf.train.Example`` records in numpy, without TensorFlow: encode, decode one, decode a batch, pad it
(or decode a batch straight into padded arrays)."""

from taskdata.example.batch import DTYPES, ExampleDecodeError, RaggedFeature, decode_batch, decode_buffer
from taskdata.example.decode import decode_example
from taskdata.example.encode import encode_example
from taskdata.example.padded import decode_padded
from taskdata.example.padding import pad_features
from taskdata.example.wire import has_kind

__all__ = [
    "DTYPES",
    "ExampleDecodeError",
    "RaggedFeature",
    "decode_batch",
    "decode_buffer",
    "decode_example",
    "decode_padded",
    "encode_example",
    "has_kind",
    "pad_features",
]
