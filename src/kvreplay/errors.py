"""Errors that are the user's to fix: the CLI prints them on one line and exits 2."""


class UserError(Exception):
    """Bad input or arguments. The message is shown as is, without a traceback."""


def write_output(path: str, fn) -> None:
    """Call fn(file) on `path` ("-" = stdout); an unwritable path is a UserError."""
    import sys

    if path == "-":
        fn(sys.stdout)
        sys.stdout.flush()
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            fn(f)
    except OSError as exc:
        raise UserError(f"{path}: cannot write: {exc.strerror}") from None


class ReplayError(UserError):
    """The log is too thin to replay; the message says what is missing."""
