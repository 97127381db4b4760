"""Static assets served by the API (the dashboard page); a package so they ship as package data."""
