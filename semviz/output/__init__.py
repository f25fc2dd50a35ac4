"""What a run becomes: the trace record (``trace``), Plotly figures (``charts``), reports
(``report``), colours and token display (``style``), escaping (``escape``) and bounded,
atomic files (``files``)."""
