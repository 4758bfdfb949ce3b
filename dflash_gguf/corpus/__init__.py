"""Training prompts cut from real text with a recorded licence (see data/README.md): Python source and
documentation of widely used packages, Debian man pages and package descriptions, and questions the target
writes itself from such seeds. Each source yields rows {category, format, source, licence, prompt}."""
