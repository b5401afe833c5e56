"""Claims over REST: creation and deletion go to the allocator; reads come from Postgres."""
