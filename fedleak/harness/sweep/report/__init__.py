"""A sweep run folder's report: charts, image grids, a CSV and one HTML page."""
