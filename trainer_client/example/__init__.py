"""The example trainer (``python -m trainer_client.example.train``): a small T5-style model on a run.

It shows the client library in use (data state, mesh, global batches, predictions); the library itself
is ``trainer_client``.
"""
