-- Cursor rows are updated once per batch that touches their stream. With
-- room left on each page, the update stays on the page (a HOT update: no
-- new primary-key entry, no index page split) and the old version is
-- pruned on the page. Applies to pages written from now on.
ALTER TABLE {{schema}}.cursors SET (fillfactor = 70);
