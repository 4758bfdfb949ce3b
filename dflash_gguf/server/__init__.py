"""OpenAI-compatible HTTP server (`dflash-gguf serve`) and model discovery (`dflash-gguf models`).

Importing this package is light; FastAPI and uvicorn load only in `app` and inside the serve command.
"""
