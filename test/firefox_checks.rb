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
    assert_equal [], meta.fetch("markerSchema")
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
    end
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
