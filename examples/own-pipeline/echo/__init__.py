"""The echo toy: audio -> audio, one stage (see echo.release)."""
