# frozen_string_literal: true

# Checks of a Firefox Profiler profile (the processed format Strobe writes),
# shared by the export and `strobe serve` tests.
module FirefoxChecks
  # The structural invariants the Firefox Profiler relies on.
  def assert_firefox_invariants(doc)
    meta = doc.fetch("meta")
    assert_equal 48, meta["preprocessedProfileVersion"]
    categories = meta.fetch("categories")
    assert(categories.any? { |c| c["color"] == "grey" }, "a grey default category")
    assert(categories.all? { |c| c["subcategories"].is_a?(Array) && c["subcategories"].first == "Other" })
    schemas = meta.fetch("markerSchema")
    assert_firefox_schemas(schemas)
    assert_equal 1, doc["threads"].count { |t| t["isMainThread"] }
    doc.fetch("threads").each do |thread|
      strings = thread.fetch("stringArray")
      %w[funcTable frameTable stackTable samples markers resourceTable nativeSymbols].each do |name|
        table = thread.fetch(name)
        columns = table.reject { |k, v| k == "length" || !v.is_a?(Array) }
        columns.each { |col, values| assert_equal table["length"], values.size, "#{thread['name']} #{name}.#{col}" }
      end
      funcs, frames, stacks, samples = thread.values_at("funcTable", "frameTable", "stackTable", "samples")
      funcs["name"].each { |i| assert_operator i, :<, strings.size }
      funcs["fileName"].compact.each { |i| assert_operator i, :<, strings.size }
      frames["func"].each { |i| assert_operator i, :<, funcs["length"] }
      frames["category"].zip(frames["subcategory"]).each do |cat, sub|
        assert_operator sub, :<, categories.fetch(cat)["subcategories"].size
      end
      frames["innerWindowID"].each { |v| assert_nil v }
      stacks["frame"].each { |i| assert_operator i, :<, frames["length"] }
      stacks["prefix"].each_with_index { |p, i| assert(p.nil? || p < i, "prefix #{p} of stack #{i}") }
      samples["stack"].each { |i| assert(i.nil? || i < stacks["length"]) }
      assert_equal samples["time"].sort, samples["time"], "samples time-ordered"
      assert_firefox_markers(thread, schemas, categories)
    end
  end

  # meta.markerSchema in the shape of format 48, which the profiler
  # upgrades: fields under "data" ("fields" breaks that upgrade), each a
  # key, a label and a format of that version, or the static Description.
  def assert_firefox_schemas(schemas)
    formats = %w[url file-path string unique-string duration time seconds milliseconds microseconds nanoseconds
                 bytes percentage integer decimal pid tid list]
    assert_equal schemas.map { |s| s["name"] }.uniq, schemas.map { |s| s["name"] }
    schemas.each do |schema|
      assert_match(/\Astrobe:/, schema["name"], "a type of Strobe's own, none the profiler treats specially")
      refute schema.key?("fields")
      assert_equal %w[marker-chart marker-table timeline-overview], schema["display"]
      fields, static = schema.fetch("data").partition { |f| f.key?("key") }
      assert_equal ["Description"], static.map { |f| f["label"] }
      fields.each do |f|
        assert_includes formats, f["format"], f.inspect
        assert_kind_of String, f["label"]
      end
    end
  end

  # A thread's markers table: names in its string array, a category of the
  # profile, instants (phase 0) without an end, intervals (1) that end at
  # or after their start, and data whose type names a schema, its values
  # of their fields' formats.
  def assert_firefox_markers(thread, schemas, categories)
    markers = thread.fetch("markers")
    by_type = schemas.to_h { |s| [s["name"], s] }
    assert_equal true, thread["showMarkersInTimeline"] if markers["length"].positive?
    markers["length"].times do |i|
      assert_operator markers["name"][i], :<, thread["stringArray"].size
      assert_operator markers["category"][i], :<, categories.size
      start, finish, phase, data = markers.values_at("startTime", "endTime", "phase", "data").map { |c| c[i] }
      assert_kind_of Numeric, start
      if phase.zero?
        assert_nil finish
      else
        assert_equal 1, phase
        assert_operator finish, :>=, start
      end
      schema = by_type.fetch(data.fetch("type"))
      formats = schema["data"].select { |f| f.key?("key") }.to_h { |f| [f["key"], f["format"]] }
      data.each do |key, value|
        next if key == "type"

        kind = { "integer" => Integer, "decimal" => Numeric, "string" => String }.fetch(formats.fetch(key))
        assert_kind_of kind, value, "#{data['type']} #{key}"
      end
    end
    starts = markers["startTime"]
    assert_equal starts.sort, starts, "markers in order of start"
  end

  # A thread's samples as stacks of function names, root first.
  def firefox_stacks(thread)
    strings, funcs, frames, stacks = thread.values_at("stringArray", "funcTable", "frameTable", "stackTable")
    thread["samples"]["stack"].map do |s|
      names = []
      while s
        names.unshift(strings[funcs["name"][frames["func"][s]]])
        s = stacks["prefix"][s]
      end
      names
    end
  end
end
