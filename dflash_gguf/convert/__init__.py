"""Turn DFlash drafters of every source schema into one validated `dflash` GGUF."""
