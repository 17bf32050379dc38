"""The builds under test and how they are had, below both engines: the built-ins' names
(``names``), where installed builds keep their libraries (``installed``), fetching, patching and
compiling sources (``compile``), and the seeds' llama.cpp built from them (``seed``)."""
