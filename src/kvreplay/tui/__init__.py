"""`kvreplay tui`: the terminal debugger (Textual). Only tui/ imports textual."""
