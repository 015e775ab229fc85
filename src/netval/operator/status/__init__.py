"""Out to the API: the status writer, the status it computes, and Events."""
