"""Text for one-line messages: a long reason shortened where a reader can still trust what is left."""


def cut_words(text: str, n: int) -> str:
  """text in at most n characters, cut at a word boundary (never mid-word) and marked with an ellipsis."""
  if len(text) <= n:
    return text
  head = text[:n - 1]
  space = head.rfind(" ")
  return (head[:space] if space > 0 else head).rstrip(" ,;:") + "\u2026"
