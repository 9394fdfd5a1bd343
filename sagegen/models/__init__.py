"""Model presets, loading, tiny pipelines and full-size architectures."""
