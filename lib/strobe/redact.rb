# frozen_string_literal: true

module Strobe
  # What a line Strobe writes (a warning, an error, an exception's message,
  # #inspect) may show of a URL or a credential: no user or password, no
  # query string, no fragment, no token.
  module Redact
    # A URL's scheme, and all up to its last "@" (a user and password,
    # which may hold "/", "?", "#", spaces or "@" when not percent-encoded).
    USERINFO = %r{\A([A-Za-z][A-Za-z0-9+.\-]*://)?.*@}m
    # A query string or a fragment, to the end.
    QUERY = /[?#].*\z/m
    HIDDEN = "[hidden]"

    module_function

    # url (a String or a URI, valid or not) as a line may show it: its user
    # and password as ***, its query and fragment as "?..." ("#...").
    #
    #   Redact.url("http://user:secret@host:4040/x?token=abc") # => "http://***@host:4040/x?..."
    def url(url)
      url.to_s.sub(USERINFO) { "#{Regexp.last_match(1)}***@" }.sub(QUERY) { |rest| "#{rest[0]}..." }
    end

    # What a URI::InvalidURIError says, without the URL it quotes
    # ("bad URI(is not URI?)").
    def uri_error(error)
      error.message[/\A[^:"]*/].to_s.strip
    end

    # An #inspect of object that shows only its class and the given fields
    # (names and values already safe to show).
    def inspect(object, **fields)
      shown = fields.map { |name, value| " #{name}=#{value.inspect}" }.join(",")
      "#<#{object.class.name}#{shown}>"
    end
  end
end
