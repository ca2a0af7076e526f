"""A cache on disk: its layout and manifest (``format``), TFRecord framing, verified readers, verification.

``taskdata.beam`` writes caches; everything here reads them and needs neither Beam nor TensorFlow.
"""
