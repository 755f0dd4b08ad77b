"""The keras-preact catalog: architecture table, recipes and (later) weights manifests.

Installed as the package data of `keras_preact.zoo`; read it with
`keras_preact.zoo_catalog.load_json(name)`.
"""
