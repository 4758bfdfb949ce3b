"""Learning from use: `serve --learn` / `run --learn` record finished requests, `train --adapt` reads them."""
