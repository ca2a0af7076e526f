"""Defining data: output features, vocabularies, tasks, mixtures, the registry and postprocessors.

Sources, preprocessors and metrics, the other parts of a task's definition, have packages of their own.
"""
